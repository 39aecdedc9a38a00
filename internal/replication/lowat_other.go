//go:build !linux

package replication

// lowWaterWorks: elsewhere a trickle is read as it comes.
const lowWaterWorks = false

func setLowWater(uintptr, int) error { return nil }

func queuedBytes(uintptr) int { return 0 }
