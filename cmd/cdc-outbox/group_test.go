package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

// order records what happened, in order.
type order struct {
	mu     sync.Mutex
	events []string
}

func (o *order) add(e string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.events = append(o.events, e)
}

func (o *order) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return fmt.Sprint(o.events)
}

// blocking is a part that runs until interrupted and records both.
func blocking(g *group, o *order, name string) {
	stop := make(chan struct{})
	g.Go(name, func() error {
		<-stop
		o.add(name + " returned")
		return nil
	}, func() {
		o.add("stop " + name)
		close(stop)
	})
}

// TestGroupStopsInReverseOrder: the parts stop last added first, each
// returned before the next is told to stop, so nothing outlives what it
// uses: run adds the HTTP endpoint, then the sink, then the loops.
func TestGroupStopsInReverseOrder(t *testing.T) {
	var o order
	g := newGroup(context.Background())
	blocking(g, &o, "http")
	g.Close(func() { o.add("close sink") })
	blocking(g, &o, "health")
	blocking(g, &o, "monitor")
	if err := g.Stop(); err != nil {
		t.Fatal(err)
	}
	want := "[stop monitor monitor returned stop health health returned close sink stop http http returned]"
	if o.String() != want {
		t.Fatalf("stopped in the order %s, want %s", o.String(), want)
	}
	if g.Context().Err() == nil {
		t.Error("the group's context is still live after Stop")
	}
}

// TestGroupFailureStopsAll: a part that fails ends the group's context,
// which is what stops the stream, and its error, named, is the group's;
// the other parts are still stopped in order.
func TestGroupFailureStopsAll(t *testing.T) {
	var o order
	g := newGroup(context.Background())
	blocking(g, &o, "monitor")
	broken := errors.New("accept tcp: use of closed network connection")
	g.Go("http endpoint", func() error { return broken }, func() { o.add("stop http") })

	select {
	case <-g.Context().Done():
	case <-time.After(10 * time.Second):
		t.Fatal("a failed part did not end the group's context")
	}
	err := g.Stop()
	if !errors.Is(err, broken) || err.Error() != "http endpoint: "+broken.Error() || !errors.Is(g.Err(), broken) {
		t.Fatalf("Stop() = %v, want the failure named after its part", err)
	}
	if want := "[stop http stop monitor monitor returned]"; o.String() != want {
		t.Fatalf("stopped in the order %s, want %s", o.String(), want)
	}
}

// TestGroupParentEnds: the parent's end (a signal) ends the group's
// context and is no failure.
func TestGroupParentEnds(t *testing.T) {
	parent, cancel := context.WithCancel(context.Background())
	g := newGroup(parent)
	var o order
	blocking(g, &o, "http")
	cancel()
	<-g.Context().Done()
	if err := g.Stop(); err != nil {
		t.Fatalf("Stop() after a signal = %v, want nil", err)
	}
}
