package main

import (
	"context"
	"fmt"
	"sync"
)

// group is the daemon's run group, in the manner of Prometheus's
// (oklog/run): the long-lived parts run side by side, each as an execute
// and an interrupt function, and the first that fails cancels the group's
// context, which stops the stream and so everything.
//
// Unlike oklog/run, the order of shutdown is explicit: Stop interrupts the
// parts in the reverse order of their adding and waits for each before the
// next, like defers, so a part is stopped before what it uses. run adds the
// HTTP endpoint first (it answers /metrics and /readyz until the very end),
// then the sink, then the loops that use it: they stop first.
type group struct {
	ctx    context.Context
	cancel context.CancelFunc

	mu    sync.Mutex
	parts []*part
	err   error // the first part's failure
}

// part is one added to the group; done is closed once execute returned.
type part struct {
	interrupt func()
	done      chan struct{}
}

func newGroup(parent context.Context) *group {
	ctx, cancel := context.WithCancel(parent)
	return &group{ctx: ctx, cancel: cancel}
}

// Context ends at the parent's end (a signal) or when a part fails.
func (g *group) Context() context.Context { return g.ctx }

// Go runs execute in a goroutine of its own until interrupt makes it
// return. An error other than nil fails the group.
func (g *group) Go(name string, execute func() error, interrupt func()) {
	p := &part{interrupt: interrupt, done: make(chan struct{})}
	g.add(p)
	go func() {
		defer close(p.done)
		if err := execute(); err != nil {
			g.failed(fmt.Errorf("%s: %w", name, err))
		}
	}()
}

// Close adds a part that runs nothing, a resource the parts added after it
// use: stop is how it is closed.
func (g *group) Close(stop func()) {
	p := &part{interrupt: stop, done: make(chan struct{})}
	close(p.done)
	g.add(p)
}

func (g *group) add(p *part) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.parts = append(g.parts, p)
}

func (g *group) failed(err error) {
	g.mu.Lock()
	if g.err == nil {
		g.err = err
	}
	g.mu.Unlock()
	g.cancel()
}

// Err is the failure of the part that failed first, or nil.
func (g *group) Err() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}

// Stop interrupts every part, last added first, waiting for each to return
// before the next, and returns the first failure, if a part failed.
func (g *group) Stop() error {
	g.mu.Lock()
	parts := g.parts
	g.parts = nil
	g.mu.Unlock()
	for i := len(parts) - 1; i >= 0; i-- {
		parts[i].interrupt()
		<-parts[i].done
	}
	g.cancel()
	return g.Err()
}
