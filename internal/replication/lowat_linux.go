package replication

import "syscall"

// lowWaterWorks: Linux reports a TCP socket readable only once
// SO_RCVLOWAT bytes are queued, in epoll too.
const lowWaterWorks = true

func setLowWater(fd uintptr, n int) error {
	return syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVLOWAT, n)
}
