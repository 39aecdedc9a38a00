package mapping

import (
	"maps"
	"sync"
	"sync/atomic"
)

// maxInterned bounds each intern cache, so a column with ever-new values
// (a per-event topic, say) cannot grow memory without limit; past it, new
// strings are simply allocated.
const maxInterned = 512

// internCache returns one shared string per distinct byte sequence. Reads
// are lock-free on a copy-on-write map: lookups happen on every row, inserts
// only until the set of topics and header keys has been seen.
type internCache struct {
	mu sync.Mutex
	m  atomic.Pointer[map[string]string]
}

func (c *internCache) get(b []byte) string {
	if m := c.m.Load(); m != nil {
		if s, ok := (*m)[string(b)]; ok {
			return s
		}
		if len(*m) >= maxInterned {
			return string(b)
		}
	}
	s := string(b)
	c.mu.Lock()
	defer c.mu.Unlock()
	var next map[string]string
	if old := c.m.Load(); old == nil {
		next = make(map[string]string)
	} else if len(*old) < maxInterned {
		next = maps.Clone(*old)
	} else {
		return s
	}
	next[s] = s
	c.m.Store(&next)
	return s
}
