package replication

import (
	"errors"
	"fmt"
	"log/slog"
	"testing"

	"github.com/jackc/pglogrepl"
)

func TestHistoryEnds(t *testing.T) {
	// A history file as PostgreSQL writes it for timeline 3: each line is a
	// parent timeline, the LSN where it ended, and why.
	history := []byte("1\t0/3000060\tno recovery target specified\n\n" +
		"# a comment\n" +
		"2\t1/A0000D8\tno recovery target specified\n")
	for _, c := range []struct {
		tli  int32
		want pglogrepl.LSN
		ok   bool
	}{
		{1, 0x3000060, true},
		{2, 0x1_0A0000D8, true},
		{3, 0, false}, // the current timeline has not ended
		{7, 0, false},
	} {
		got, ok := historyEnds(history)[c.tli]
		if got != c.want || ok != c.ok {
			t.Errorf("historyEnds[tli %d] = %s, %v; want %s, %v", c.tli, got, ok, c.want, c.ok)
		}
	}
	if _, ok := historyEnds([]byte("x\ty\n1\tnot-an-lsn\n"))[1]; ok {
		t.Error("an unparsable LSN was accepted")
	}
}

// resending is a Handler whose WAL fails with err.
type resending struct{ err error }

func (h resending) WAL(pglogrepl.LSN, []byte) error { return h.err }
func (resending) Full() bool                        { return false }
func (resending) Room() <-chan struct{}             { return nil }
func (resending) Failed() <-chan error              { return nil }
func (resending) Lost()                             {}
func (resending) InFlight() int                     { return 0 }
func (resending) Newest() pglogrepl.LSN             { return 0 }

type resendErr struct{}

func (resendErr) Error() string { return "skipped what must be read again" }
func (resendErr) Resend() bool  { return true }

// TestHandlerAsksToReadAgain: a handler's error that asks to be sent again
// (Resend) ends the connection without stopping the stream, as a catalog
// error does; any other error stops it for good.
func TestHandlerAsksToReadAgain(t *testing.T) {
	xlog := append([]byte{pglogrepl.XLogDataByteID}, make([]byte, 24)...)
	xlog = append(xlog, 'B')
	for _, c := range []struct {
		err   error
		fatal bool
	}{
		{fmt.Errorf("wrapped: %w", resendErr{}), false},
		{fmt.Errorf("%w: look up relation", ErrCatalog), false},
		{errors.New("a bad row"), true},
	} {
		s := New(Config{}, resending{c.err}, confirmedAt(0), slog.New(slog.DiscardHandler))
		err := s.copyData(nil, xlog)
		var f fatal
		if !errors.Is(err, c.err) || errors.As(err, &f) != c.fatal {
			t.Errorf("copyData with a handler failing %v: %v (fatal %v), want fatal %v", c.err, err, errors.As(err, &f), c.fatal)
		}
	}
}
