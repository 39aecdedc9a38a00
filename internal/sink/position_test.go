package sink

import (
	"testing"
	"time"
)

// TestCheckpointValue: a checkpoint names its commit (timeline, xid, commit
// time to the microsecond) and reads back the same; a record of an older
// version, which has none of them, still reads, with a commit that names
// nothing (timeline 0), so it is never taken for verifiable.
func TestCheckpointValue(t *testing.T) {
	at := Commit{End: 0x16B3748, Timeline: 2, Xid: 7401, CommitTime: time.Date(2026, 1, 2, 15, 4, 5, 123456000, time.UTC)}
	r := CheckpointRecordAt("cp", "slot", "1/2/3", at)
	got, origin, err := parseCheckpoint(r.Value)
	if err != nil || got != at || origin != "1/2/3" {
		t.Fatalf("round trip of %s: %+v %q %v, want %+v", r.Value, got, origin, err, at)
	}
	past := Commit{End: 0x16B3800, Named: 0x16B3748, Timeline: 2, Xid: 7401, CommitTime: at.CommitTime}
	if got, _, err := parseCheckpoint(CheckpointRecordAt("cp", "slot", "1/2/3", past).Value); err != nil || got != past {
		t.Fatalf("round trip of a checkpoint past its commit: %+v %v, want %+v", got, err, past)
	}
	old := []byte(`{"lsn":"0/16B3748","origin":"1/2/3"}`)
	got, origin, err = parseCheckpoint(old)
	if err != nil || got != (Commit{End: 0x16B3748}) || origin != "1/2/3" {
		t.Fatalf("an older record %s: %+v %q %v", old, got, origin, err)
	}
	if r := CheckpointRecord("cp", "slot", "1/2/3", 0x16B3748); string(r.Value) != string(old) {
		t.Fatalf("a record without a commit is %s, want %s", r.Value, old)
	}
	if _, _, err := parseCheckpoint([]byte(`{"lsn":"x"}`)); err == nil {
		t.Fatal("a bad LSN parsed")
	}
}
