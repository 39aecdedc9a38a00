package checkpoint

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
)

// Epoch is a history of the stream's WAL that began where Kafka was found
// to hold events of another one, which the server does not have: a
// failover to a standby that had not received everything cdc-outbox
// published, or a cluster restored from a backup. The server commits other
// transactions where the lost ones were, and its sequences hand out the
// same ids again; under the same source a consumer deduping by (source,
// id) would drop those new events as repeats of lost ones. So every event
// committed at or after From carries the source with the epoch's number
// (Source), which no event of the lost history has.
//
// A failover that lost nothing (the standby had everything published, as
// synchronized_standby_slots makes sure) begins no epoch: the source stays.
type Epoch struct {
	N int // 1, 2, …: the number the source carries
	// Timeline is the timeline of the server the new history is on, and
	// From the LSN where it began: commits at or after From are the
	// epoch's. 0 when where the histories part is not known (a restore):
	// every event streamed from then on is the epoch's, a repeat under
	// the new source at worst.
	Timeline int32
	From     pglogrepl.LSN
	// Lost is what Kafka holds of the lost history: the events of epoch
	// LostEpoch from the WAL from LostFrom to LostTo of LostTimeline, for
	// operators to reconcile.
	LostEpoch        int
	LostTimeline     int32
	LostFrom, LostTo pglogrepl.LSN
	At               time.Time // when cdc-outbox found it
}

func (e Epoch) String() string {
	return fmt.Sprintf("epoch %d: from %s on timeline %d; lost: epoch %d's WAL from %s to %s of timeline %d; found %s",
		e.N, e.From, e.Timeline, e.LostEpoch, e.LostFrom, e.LostTo, e.LostTimeline, e.At.UTC().Format(time.RFC3339))
}

// Epochs are a stream's epochs in order of N.
type Epochs []Epoch

// At is the epoch of a transaction whose commit record starts at commit:
// the newest one that began at or before it; 0 (the first history) when
// none did.
func (es Epochs) At(commit pglogrepl.LSN) int {
	for i := len(es) - 1; i >= 0; i-- {
		if es[i].From <= commit {
			return es[i].N
		}
	}
	return 0
}

// Begin adds e as the next epoch unless it is one of es already, found
// again after a restart: the same history (timeline and From) lost from
// the same one (epoch and timeline). That one keeps its number; only its
// lost range may grow (a restart reads a checkpoint short of what the
// running stream had published). It returns the epochs and the epoch that
// stands for e; changed reports whether the epochs did.
func (es Epochs) Begin(e Epoch) (out Epochs, got Epoch, changed bool) {
	for i, o := range es {
		if o.Timeline == e.Timeline && o.From == e.From && o.LostEpoch == e.LostEpoch && o.LostTimeline == e.LostTimeline {
			if e.LostTo <= o.LostTo {
				return es, o, false
			}
			out = append(Epochs(nil), es...)
			out[i].LostTo = e.LostTo
			return out, out[i], true
		}
	}
	e.N = 1
	if len(es) > 0 {
		e.N = es[len(es)-1].N + 1
	}
	return append(append(Epochs(nil), es...), e), e, true
}

// Source is the source of the events of epoch n of an outbox whose source
// is base: base itself for the first history, so that a stream that never
// lost one keeps the source it always had.
func Source(base string, n int) string {
	if n == 0 {
		return base
	}
	return fmt.Sprintf("%s/epoch-%d", base, n)
}

// epochValue is an epoch as its record keeps it (Encode).
type epochValue struct {
	N            int    `json:"n"`
	Timeline     int32  `json:"timeline"`
	From         string `json:"from_lsn"`
	LostEpoch    int    `json:"lost_epoch"`
	LostTimeline int32  `json:"lost_timeline"`
	LostFrom     string `json:"lost_from_lsn"`
	LostTo       string `json:"lost_to_lsn"`
	At           string `json:"found_at"`
}

// Encode is the value of the epochs record (sink.EpochsKey): JSON, an
// operator reads it with any Kafka tool.
func (es Epochs) Encode() []byte {
	v := struct {
		Epochs []epochValue `json:"epochs"`
	}{make([]epochValue, len(es))}
	for i, e := range es {
		v.Epochs[i] = epochValue{N: e.N, Timeline: e.Timeline, From: e.From.String(), LostEpoch: e.LostEpoch, LostTimeline: e.LostTimeline,
			LostFrom: e.LostFrom.String(), LostTo: e.LostTo.String(), At: e.At.UTC().Format(time.RFC3339Nano)}
	}
	b, _ := json.Marshal(v) // strings and numbers always encode
	return b
}

// DecodeEpochs reads an epochs record's value; nil is none.
func DecodeEpochs(value []byte) (Epochs, error) {
	if value == nil {
		return nil, nil
	}
	var v struct {
		Epochs []epochValue `json:"epochs"`
	}
	if err := json.Unmarshal(value, &v); err != nil {
		return nil, fmt.Errorf("history epochs record %q: %w", value, err)
	}
	es := make(Epochs, len(v.Epochs))
	for i, e := range v.Epochs {
		var lsns [3]pglogrepl.LSN
		for j, s := range []string{e.From, e.LostFrom, e.LostTo} {
			lsn, err := pglogrepl.ParseLSN(s)
			if err != nil {
				return nil, fmt.Errorf("history epochs record %q: epoch %d: %w", value, e.N, err)
			}
			lsns[j] = lsn
		}
		at, err := time.Parse(time.RFC3339Nano, e.At)
		if err != nil {
			return nil, fmt.Errorf("history epochs record %q: epoch %d: %w", value, e.N, err)
		}
		es[i] = Epoch{N: e.N, Timeline: e.Timeline, From: lsns[0], LostEpoch: e.LostEpoch, LostTimeline: e.LostTimeline,
			LostFrom: lsns[1], LostTo: lsns[2], At: at}
	}
	return es, nil
}

// Published is how far an at-least-once stream had handed transactions to
// Kafka, on which timeline and in which epoch, as it records every second:
// at-least-once delivery keeps no checkpoint, and without it a start on a
// promoted standby could not know that Kafka holds events past the fork.
// It lags what was published by up to its interval, so a history lost
// within the last interval before a crash goes unseen; longer ones, the
// ones a cut-off standby makes, are found.
type Published struct {
	End      pglogrepl.LSN
	Timeline int32
	Epoch    int
}

// Encode is the value of the published record.
func (p Published) Encode() []byte {
	b, _ := json.Marshal(struct {
		End      string `json:"lsn"`
		Timeline int32  `json:"timeline"`
		Epoch    int    `json:"epoch"`
	}{p.End.String(), p.Timeline, p.Epoch})
	return b
}

// DecodePublished reads a published record's value; nil is none (the zero
// Published).
func DecodePublished(value []byte) (Published, error) {
	if value == nil {
		return Published{}, nil
	}
	var v struct {
		End      string `json:"lsn"`
		Timeline int32  `json:"timeline"`
		Epoch    int    `json:"epoch"`
	}
	if err := json.Unmarshal(value, &v); err != nil {
		return Published{}, fmt.Errorf("published record %q: %w", value, err)
	}
	lsn, err := pglogrepl.ParseLSN(v.End)
	if err != nil {
		return Published{}, fmt.Errorf("published record %q: %w", value, err)
	}
	return Published{End: lsn, Timeline: v.Timeline, Epoch: v.Epoch}, nil
}

// LostPast says whether what p says was published lies on WAL that a
// server on timeline, whose history's earlier timelines ended at ends and
// whose WAL is flushed up to flushed, does not have, and where the
// server's own history then parts from it (0: not known): as Decide does
// for a checkpoint, without a commit to verify. Published on an earlier
// timeline past its end: lost from that end (a failover past what the
// standby had). Past the server's flushed WAL: lost, from an unknown place
// (a restore). A record on a timeline the history does not have says
// nothing.
func LostPast(p Published, timeline int32, ends map[int32]pglogrepl.LSN, flushed pglogrepl.LSN) (lost bool, from pglogrepl.LSN) {
	if p.Timeline == 0 {
		return false, 0
	}
	if p.Timeline != timeline {
		end, ok := ends[p.Timeline]
		if !ok {
			return false, 0
		}
		if p.End > end {
			return true, end
		}
	}
	if p.End > flushed {
		return true, 0
	}
	return false, 0
}

// Lost reports whether an epoch of es records the history the checkpoint m
// was written on as lost at m's position: Kafka holds it, the server does
// not. Decide, which judges by positions, may find such a checkpoint on
// the server's WAL once the server has written that far again on the same
// timeline (a restore); its commit, or the lone message it was written at,
// is then another history's, and the stream must skip nothing by it.
func (es Epochs) Lost(m Mark) bool {
	for _, e := range es {
		if e.N > m.Epoch && e.LostEpoch == m.Epoch && e.LostTimeline == m.Timeline && e.LostFrom < m.End && m.End <= e.LostTo {
			return true
		}
	}
	return false
}
