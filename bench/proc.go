package main

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// procUsage is what the kernel says about a process: CPU time used so far
// (user + system, all threads) and its peak and current resident set.
type procUsage struct {
	cpu    time.Duration
	hwmKiB uint64 // VmHWM: peak RSS since the process started
	rssKiB uint64 // VmRSS: RSS now
}

// clockTick is the unit of utime/stime in /proc/<pid>/stat (USER_HZ). It is
// 100 on every mainstream Linux, but asking getconf costs nothing.
var clockTick = func() time.Duration {
	out, err := exec.Command("getconf", "CLK_TCK").Output()
	if err == nil {
		if hz, err := strconv.Atoi(strings.TrimSpace(string(out))); err == nil && hz > 0 {
			return time.Second / time.Duration(hz)
		}
	}
	return 10 * time.Millisecond
}()

// parseStatCPU returns utime+stime in clock ticks from the contents of
// /proc/<pid>/stat. The command name (field 2) is in parentheses and may
// itself hold spaces and parentheses, so fields are counted from the last
// ')'.
func parseStatCPU(stat string) (uint64, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("no command name in stat %q", stat)
	}
	f := strings.Fields(stat[i+1:])
	// After ')': state(3) ppid(4) ... utime(14) stime(15), so utime is f[11].
	if len(f) < 13 {
		return 0, fmt.Errorf("short stat %q", stat)
	}
	ut, err := strconv.ParseUint(f[11], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("utime: %w", err)
	}
	st, err := strconv.ParseUint(f[12], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("stime: %w", err)
	}
	return ut + st, nil
}

// parseStatusKiB returns a "Key:   123 kB" field of /proc/<pid>/status.
func parseStatusKiB(status, key string) (uint64, error) {
	for _, line := range strings.Split(status, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || k != key {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			break
		}
		n, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", key, err)
		}
		if len(f) > 1 && f[1] != "kB" {
			return 0, fmt.Errorf("%s: unexpected unit %q", key, f[1])
		}
		return n, nil
	}
	return 0, fmt.Errorf("no %s in status", key)
}

// readUsage reads a live process's CPU time and memory from /proc.
func readUsage(pid int) (procUsage, error) {
	cpu, err := readCPU(pid)
	if err != nil {
		return procUsage{}, err
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return procUsage{}, err
	}
	u := procUsage{cpu: cpu}
	if u.hwmKiB, err = parseStatusKiB(string(status), "VmHWM"); err != nil {
		return procUsage{}, err
	}
	if u.rssKiB, err = parseStatusKiB(string(status), "VmRSS"); err != nil {
		return procUsage{}, err
	}
	return u, nil
}

// readCPU is the CPU time a process has used so far.
func readCPU(pid int) (time.Duration, error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	ticks, err := parseStatCPU(string(stat))
	if err != nil {
		return 0, err
	}
	return time.Duration(ticks) * clockTick, nil
}

// procComm is a process's command name (/proc/<pid>/comm), to check that a
// pid reported by the server is a PostgreSQL process on this machine.
func procComm(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func mib(kib uint64) float64 { return float64(kib) / 1024 }

// activity is what a process asked of the kernel so far: read and write
// system calls (/proc/<pid>/io syscr, syscw: sockets included) and context
// switches summed over its threads (/proc/<pid>/task/*/status), voluntary
// ones being a thread going to sleep, each paid again by its wake-up.
type activity struct {
	reads, writes       uint64
	voluntary, involunt uint64
	runNanos            uint64 // on-CPU time of its threads (schedstat), ns
}

func (a activity) sub(b activity) activity {
	return activity{a.reads - b.reads, a.writes - b.writes, a.voluntary - b.voluntary, a.involunt - b.involunt, a.runNanos - b.runNanos}
}

// parseIO returns syscr and syscw from the contents of /proc/<pid>/io.
func parseIO(io string) (reads, writes uint64, err error) {
	var seen int
	for _, line := range strings.Split(io, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		n, perr := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		switch k {
		case "syscr":
			reads, err, seen = n, perr, seen+1
		case "syscw":
			writes, err, seen = n, perr, seen+1
		}
		if err != nil {
			return 0, 0, fmt.Errorf("%s: %w", k, err)
		}
	}
	if seen != 2 {
		return 0, 0, fmt.Errorf("no syscr and syscw in %q", io)
	}
	return reads, writes, nil
}

// readActivity reads a live process's system calls, context switches and
// CPU time. Threads that ended take their switches with them; a Go
// program's threads live as long as it does.
func readActivity(pid int) (activity, error) {
	var a activity
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return a, err
	}
	if a.reads, a.writes, err = parseIO(string(b)); err != nil {
		return a, err
	}
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return a, err
	}
	for _, t := range tasks {
		dir := fmt.Sprintf("/proc/%d/task/%s/", pid, t.Name())
		status, err := os.ReadFile(dir + "status")
		if err != nil {
			continue // the thread ended meanwhile
		}
		v, _ := parseStatusCount(string(status), "voluntary_ctxt_switches")
		n, _ := parseStatusCount(string(status), "nonvoluntary_ctxt_switches")
		a.voluntary += v
		a.involunt += n
		if ss, err := os.ReadFile(dir + "schedstat"); err == nil {
			var ns uint64
			fmt.Sscanf(string(ss), "%d", &ns)
			a.runNanos += ns
		}
	}
	return a, nil
}

// parseStatusCount returns a "Key:\t123" field of /proc/<pid>/status.
func parseStatusCount(status, key string) (uint64, error) {
	for _, line := range strings.Split(status, "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && k == key {
			return strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, fmt.Errorf("no %s in status", key)
}
