package replication

import (
	"bytes"
	"io"
	"testing"
	"time"
)

// chunks returns one chunk per Read.
type chunks [][]byte

func (c *chunks) Read(p []byte) (int, error) {
	if len(*c) == 0 {
		return 0, io.EOF
	}
	n := copy(p, (*c)[0])
	*c = (*c)[1:]
	return n, nil
}

func TestNapReader(t *testing.T) {
	small, big := bytes.Repeat([]byte("s"), 300), bytes.Repeat([]byte("b"), napBelow)
	cases := []struct {
		name  string
		reads [][]byte
		pause time.Duration // between reads
		naps  int
	}{
		{"trickle naps before each read after the first", [][]byte{small, small, small}, 0, 2},
		{"a full buffer reads on at once", [][]byte{big, big, small}, 0, 0},
		{"after a quiet spell no nap", [][]byte{small, small}, napWithin + time.Millisecond, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			src := chunks(c.reads)
			naps := 0
			r := &napReader{r: &src, sleep: func(d time.Duration) {
				if d != nap {
					t.Errorf("slept %s", d)
				}
				naps++
			}}
			buf := make([]byte, 2*napBelow)
			for range c.reads {
				if _, err := r.Read(buf); err != nil {
					t.Fatal(err)
				}
				time.Sleep(c.pause)
			}
			if naps != c.naps {
				t.Fatalf("%d naps, want %d", naps, c.naps)
			}
		})
	}
}
