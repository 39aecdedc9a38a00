package testenv

import (
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
)

// lowestPort is the lowest port FreePort hands out, as scripts/lib/ports.sh:
// below it lie the well-known and commonly configured ports.
const lowestPort = 10000

// FreePort returns a port of 127.0.0.1 that nothing listens on now, for a
// program the test starts that binds it later (the demo's HTTP port, the
// streamer's HTTP address when the test must know it beforehand). It is
// below the kernel's ephemeral range, as the servers' ports of
// scripts/lib/ports.sh: a port the kernel hands out (127.0.0.1:0) can be
// given to any outgoing connection before the program binds it.
func FreePort(t testing.TB) int {
	t.Helper()
	rangeText, _ := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	high := ephemeralStart(string(rangeText))
	for range 200 {
		port := lowestPort + rand.IntN(high-lowestPort)
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err == nil {
			ln.Close()
			return port
		}
	}
	t.Fatalf("no free port on 127.0.0.1 between %d and %d after 200 tries", lowestPort, high)
	return 0
}

// ephemeralStart is the first port of the kernel's ephemeral range as
// /proc/sys/net/ipv4/ip_local_port_range gives it ("32768\t60999\n"), or
// Linux's default start when the text says nothing usable or leaves no
// room below it.
func ephemeralStart(rangeText string) int {
	const linuxDefault = 32768
	fields := strings.Fields(rangeText)
	if len(fields) == 0 {
		return linuxDefault
	}
	lo, err := strconv.Atoi(fields[0])
	if err != nil || lo < lowestPort+2000 {
		return linuxDefault
	}
	return lo
}
