package replication

import (
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
