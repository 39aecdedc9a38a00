package main

import "testing"

func TestParseProcStat(t *testing.T) {
	stat := "cpu  100 5 50 800 20 3 2 0 0 0\ncpu0 50 2 25 400 10 1 1 0 0 0\nintr 123\nctxt 456\nprocs_running 3\nprocs_blocked 0\n"
	idle, total, running, err := parseProcStat(stat)
	if err != nil {
		t.Fatal(err)
	}
	// idle + iowait of the all-cores line, not of cpu0.
	if idle != 820 || total != 980 || running != 3 {
		t.Fatalf("idle %d total %d running %d, want 820 980 3", idle, total, running)
	}
	if _, _, _, err := parseProcStat("cpu0 1 2 3 4\n"); err == nil {
		t.Fatal("a stat without the cpu and procs_running lines parsed")
	}
}
