package replication

import (
	"errors"
	"testing"

	"github.com/jackc/pglogrepl"
)

// TestJudge: what a new replication connection lets the stream do, for
// each way the server can have changed under it.
func TestJudge(t *testing.T) {
	a1 := Server{SystemID: "7301", Timeline: 1, Addr: "a:5432"}
	b2 := Server{SystemID: "7301", Timeline: 2, Addr: "b:5432"}
	history := func(tl int32, flushed pglogrepl.LSN, ends map[int32]pglogrepl.LSN) History {
		return History{Timeline: tl, Flushed: flushed, Ends: ends}
	}
	for _, c := range []struct {
		name string
		r    Reconnection
		want error // nil, ErrOtherCluster, ErrBeyondFork or ErrRestored
		over bool
	}{
		{"the first connection", Reconnection{Now: a1, History: history(1, 0x100, nil), Confirmed: 0x500}, nil, false},
		{"the same server, further on", Reconnection{Was: a1, Now: a1, History: history(1, 0x900, nil), Confirmed: 0x500, LastSent: 0x500, Newest: 0x800}, nil, false},
		{"the same server after a crash: WAL up to what was read", Reconnection{Was: a1, Now: a1, History: history(1, 0x800, nil), Confirmed: 0x500, Newest: 0x800}, nil, false},
		{"restored: WAL ends before the confirmed position", Reconnection{Was: a1, Now: a1, History: history(1, 0x300, nil), Confirmed: 0x500, LastSent: 0x500, Newest: 0x500}, ErrRestored, false},
		{"restored: WAL ends before a transaction waiting for Kafka", Reconnection{Was: a1, Now: a1, History: history(1, 0x600, nil), Confirmed: 0x500, Newest: 0x700}, ErrRestored, false},
		{"restored: WAL ends before the last position sent", Reconnection{Was: a1, Now: a1, History: history(1, 0x600, nil), Confirmed: 0x500, LastSent: 0x650}, ErrRestored, false},
		{"another cluster", Reconnection{Was: a1, Now: Server{SystemID: "9999", Timeline: 1}, History: history(1, 0x900, nil)}, ErrOtherCluster, false},
		{"a timeline whose history lacks the old one", Reconnection{Was: a1, Now: b2, History: history(2, 0x900, map[int32]pglogrepl.LSN{})}, ErrOtherCluster, false},
		{"a failover that lost nothing", Reconnection{Was: a1, Now: b2, History: history(2, 0x900, map[int32]pglogrepl.LSN{1: 0x600}), Confirmed: 0x500, Newest: 0x600}, nil, true},
		{"a failover past the confirmed position", Reconnection{Was: a1, Now: b2, History: history(2, 0x900, map[int32]pglogrepl.LSN{1: 0x400}), Confirmed: 0x500}, ErrBeyondFork, false},
		{"a failover past a transaction sent in part", Reconnection{Was: a1, Now: b2, History: history(2, 0x900, map[int32]pglogrepl.LSN{1: 0x600}), Confirmed: 0x500, Newest: 0x650}, ErrBeyondFork, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			v := Judge(c.r)
			switch {
			case c.want == nil && v.Err != nil:
				t.Fatalf("Judge: %v, want to resume", v.Err)
			case c.want != nil && !errors.Is(v.Err, c.want):
				t.Fatalf("Judge: %v, want %v", v.Err, c.want)
			case v.FailedOver != c.over:
				t.Fatalf("FailedOver %v, want %v", v.FailedOver, c.over)
			}
		})
	}
}
