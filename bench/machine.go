package main

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"time"
)

// machineLoad is how busy the whole machine was during a window: the share
// of CPU time idle (all cores, /proc/stat) and the mean number of runnable
// threads (procs_running, sampled), against the number of cores. A
// latency measured while the run queue exceeds the cores says as much
// about the machine as about the program.
type machineLoad struct {
	idle     float64 // 0..1
	runQueue float64 // mean procs_running
	load1    float64 // 1-minute load average at the end
}

func (m machineLoad) String() string {
	return fmt.Sprintf("CPU idle %.0f%%, run queue %.1f, load %.1f", 100*m.idle, m.runQueue, m.load1)
}

// parseProcStat returns the idle (idle + iowait) and total jiffies of the
// "cpu" line and procs_running from the contents of /proc/stat.
func parseProcStat(stat string) (idle, total, running uint64, err error) {
	seen := 0
	for _, line := range strings.Split(stat, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		switch f[0] {
		case "cpu":
			for i, v := range f[1:] {
				var n uint64
				if _, err := fmt.Sscanf(v, "%d", &n); err != nil {
					return 0, 0, 0, fmt.Errorf("cpu field %d: %w", i, err)
				}
				total += n
				if i == 3 || i == 4 { // idle, iowait
					idle += n
				}
			}
			seen++
		case "procs_running":
			if len(f) == 2 {
				fmt.Sscanf(f[1], "%d", &running)
				seen++
			}
		}
	}
	if seen != 2 {
		return 0, 0, 0, fmt.Errorf("no cpu or procs_running line in /proc/stat")
	}
	return idle, total, running, nil
}

func readProcStat() (idle, total, running uint64, err error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, 0, err
	}
	return parseProcStat(string(b))
}

// watchMachine samples /proc/stat every 200 ms until the returned function
// is called, which reports the window.
func watchMachine() (stop func() machineLoad) {
	idle0, total0, _, err0 := readProcStat()
	done := make(chan struct{})
	var mu sync.Mutex
	var sum, n uint64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				if _, _, r, err := readProcStat(); err == nil {
					mu.Lock()
					sum, n = sum+r, n+1
					mu.Unlock()
				}
			}
		}
	}()
	return func() machineLoad {
		close(done)
		wg.Wait()
		var m machineLoad
		idle1, total1, _, err1 := readProcStat()
		if err0 == nil && err1 == nil && total1 > total0 {
			m.idle = float64(idle1-idle0) / float64(total1-total0)
		}
		if n > 0 {
			// The sampler itself is one of the running threads.
			m.runQueue = max(0, float64(sum)/float64(n)-1)
		}
		m.load1 = loadAverage()
		return m
	}
}
