package replication

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// lowWaterWorks: Linux reports a TCP socket readable only once
// SO_RCVLOWAT bytes are queued, in epoll too.
const lowWaterWorks = true

func setLowWater(fd uintptr, n int) error {
	return syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVLOWAT, n)
}

// queuedBytes is what the socket holds unread (SIOCINQ); 0 when unknown.
func queuedBytes(fd uintptr) int {
	n, err := unix.IoctlGetInt(int(fd), unix.SIOCINQ)
	if err != nil {
		return 0
	}
	return n
}
