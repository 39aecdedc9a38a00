package testenv

import (
	"net"
	"os"
	"strconv"
	"testing"
)

func TestEphemeralStart(t *testing.T) {
	for text, want := range map[string]int{
		"32768\t60999\n": 32768,
		"49152 65535":    49152,
		"":               32768, // no /proc (not Linux)
		"1024\t65535\n":  32768, // no room below the range
		"x y":            32768,
	} {
		if got := ephemeralStart(text); got != want {
			t.Errorf("ephemeralStart(%q) = %d, want %d", text, got, want)
		}
	}
}

// TestFreePortBelowEphemeral: the port is below the ephemeral range, and
// free: the test can listen on it.
func TestFreePortBelowEphemeral(t *testing.T) {
	rangeText, _ := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	high := ephemeralStart(string(rangeText))
	port := FreePort(t)
	if port < lowestPort || port >= high {
		t.Errorf("FreePort = %d, want one in [%d, %d), below the ephemeral range %q", port, lowestPort, high, rangeText)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		t.Fatalf("listen on the free port %d: %v", port, err)
	}
	ln.Close()
}
