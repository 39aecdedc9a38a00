package main

import (
	"os"
	"testing"
)

func TestParseStatCPU(t *testing.T) {
	// The command name holds a space and a parenthesis, which is why fields
	// are counted from the last ')'.
	stat := "4242 (cdc (out) box) S 1 4242 4242 0 -1 4194560 1234 0 0 0 250 75 0 0 20 0 9 0 12345 1000000 2000 18446744073709551615"
	got, err := parseStatCPU(stat)
	if err != nil {
		t.Fatal(err)
	}
	if got != 325 {
		t.Fatalf("utime+stime = %d, want 325", got)
	}
	if _, err := parseStatCPU("4242 (x) S 1"); err == nil {
		t.Fatal("short stat parsed")
	}
}

func TestParseStatusKiB(t *testing.T) {
	status := "Name:\tcdc-outbox\nVmPeak:\t  812345 kB\nVmHWM:\t   40960 kB\nVmRSS:\t   30720 kB\nThreads:\t9\n"
	if v, err := parseStatusKiB(status, "VmHWM"); err != nil || v != 40960 {
		t.Fatalf("VmHWM = %d, %v", v, err)
	}
	if v, err := parseStatusKiB(status, "VmRSS"); err != nil || v != 30720 {
		t.Fatalf("VmRSS = %d, %v", v, err)
	}
	if _, err := parseStatusKiB(status, "VmSwap"); err == nil {
		t.Fatal("missing key found")
	}
}

func TestReadUsageOfSelf(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc")
	}
	u, err := readUsage(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if u.hwmKiB == 0 || u.rssKiB == 0 || u.hwmKiB < u.rssKiB {
		t.Fatalf("implausible usage %+v", u)
	}
}

func TestParseIO(t *testing.T) {
	io := "rchar: 4096\nwchar: 2048\nsyscr: 31\nsyscw: 17\nread_bytes: 0\nwrite_bytes: 0\ncancelled_write_bytes: 0\n"
	r, w, err := parseIO(io)
	if err != nil || r != 31 || w != 17 {
		t.Fatalf("syscr %d syscw %d err %v, want 31 17", r, w, err)
	}
	if _, _, err := parseIO("rchar: 1\n"); err == nil {
		t.Fatal("io without syscr and syscw parsed")
	}
}

func TestReadActivityOfSelf(t *testing.T) {
	if _, err := os.Stat("/proc/self/io"); err != nil {
		t.Skip("no /proc/self/io")
	}
	a, err := readActivity(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if a.reads == 0 || a.runNanos == 0 {
		t.Fatalf("implausible activity %+v", a)
	}
}
