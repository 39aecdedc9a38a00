package decoder_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/cdc-outbox/cdc-outbox/internal/decoder"
)

// FuzzDecode feeds two arbitrary messages to a decoder that already knows the
// outbox table and one other table (and no role for any other relation). Two, so that the fuzzer can pair a
// Relation message of its own with a change that uses it. It checks that
// Decode never panics, that every error is a *MessageError wrapping a
// sentinel, and that every event is consistent.
//
//	go test -fuzz=FuzzDecode ./internal/decoder
func FuzzDecode(f *testing.F) {
	for _, m := range validMessages() {
		f.Add(m, outboxInsert())
	}
	// A table altered under the decoder, then an insert in its new shape.
	f.Add(relationMsg(outboxID, "public", "outbox", "payload", "id", "extra"),
		insertMsg(outboxID, text("{}"), null, text("x")))
	// A new table, then a change of it.
	f.Add(relationMsg(77, "public", "orders", "id"), deleteMsg(77, 'K', text("1")))
	// A relation without a role (a partition not yet looked up), then an
	// insert into it.
	f.Add(relationMsg(78, "public", "outbox_p1", outboxColumns...), insertMsg(78, text("1"), null, null, null, text("{}"), null, null))

	// An outbox message inside a transaction, and one outside any.
	f.Add(beginMsg(0x400, 0, 3), outboxMsg(true, 0x3f0, `{"v":1,"id":"1"}`))
	f.Add(outboxMsg(false, 0x3f0, "{}"), commitMsg(0x400, 0x430, 0))

	f.Fuzz(func(t *testing.T, first, second []byte) {
		d := primed(t)
		for _, m := range [][]byte{first, second} {
			ev, err := d.Decode(m)
			if err != nil {
				checkError(t, m, ev, err)
			} else {
				checkEvent(t, m, ev)
			}
		}
	})
}

func checkError(t *testing.T, m []byte, ev *decoder.Event, err error) {
	var me *decoder.MessageError
	switch {
	case ev != nil:
		t.Fatalf("%q: event %+v returned with error %v", m, ev, err)
	case !errors.As(err, &me):
		t.Fatalf("%q: error %v is not a *MessageError", m, err)
	case !errors.Is(err, decoder.ErrTruncated) && !errors.Is(err, decoder.ErrMalformed) &&
		!errors.Is(err, decoder.ErrUnknownRelation) && !errors.Is(err, decoder.ErrUnknownMessageType):
		t.Fatalf("%q: error %v wraps no sentinel", m, err)
	case len(m) > 0 && me.Type != m[0]:
		t.Fatalf("%q: error %v names type %q", m, err, me.Type)
	case me.Offset < 0 || me.Offset > len(m):
		t.Fatalf("%q: error %v has offset outside the message", m, err)
	}
}

func checkEvent(t *testing.T, m []byte, ev *decoder.Event) {
	if ev == nil {
		t.Fatalf("%q: nil event without error", m)
	}
	switch ev.Kind {
	case decoder.KindInsert:
		rel := ev.Relation
		if rel == nil || rel.Role != decoder.RoleOutbox {
			t.Fatalf("%q: insert into non-outbox relation %+v", m, rel)
		}
		checkValues(t, m, ev)
	case decoder.KindUnmapped:
		if rel := ev.Relation; rel == nil || rel.Role != decoder.RoleUnmapped {
			t.Fatalf("%q: unmapped insert into relation %+v", m, rel)
		}
		checkValues(t, m, ev)
	case decoder.KindRelation:
		rel := ev.Relation
		if rel == nil || len(rel.Wanted) != len(outboxWanted) {
			t.Fatalf("%q: bad relation %+v", m, rel)
		}
		for _, col := range rel.Wanted {
			if col < -1 || col >= len(rel.Columns) {
				t.Fatalf("%q: wanted index %d out of range in %+v", m, col, rel)
			}
		}
	case decoder.KindSkip:
		switch ev.SkipReason {
		case decoder.SkipUpdate, decoder.SkipDelete, decoder.SkipTruncate, decoder.SkipOtherTable, decoder.SkipOtherPrefix:
		default:
			t.Fatalf("%q: skip reason %q", m, ev.SkipReason)
		}
		if ev.Values != nil || ev.Tuple != nil {
			t.Fatalf("%q: skip carries values", m)
		}
	case decoder.KindMessage:
		if string(ev.Prefix) != outboxMsgPrefix || len(ev.Content) > len(m) || ev.Relation != nil || ev.Values != nil {
			t.Fatalf("%q: message %+v", m, ev)
		}
	case decoder.KindBegin, decoder.KindCommit, decoder.KindIgnore:
		if ev.Relation != nil || ev.Values != nil {
			t.Fatalf("%q: %v event carries a relation or values", m, ev.Kind)
		}
	default:
		t.Fatalf("%q: unknown kind %v", m, ev.Kind)
	}
}

// checkValues checks that an Insert or Unmapped event's values are its
// tuple's wanted columns.
func checkValues(t *testing.T, m []byte, ev *decoder.Event) {
	rel := ev.Relation
	if len(ev.Values) != len(outboxWanted) || len(ev.Tuple) != len(rel.Columns) {
		t.Fatalf("%q: %d values, %d tuple columns; want %d, %d", m, len(ev.Values), len(ev.Tuple), len(outboxWanted), len(rel.Columns))
	}
	for i, col := range rel.Wanted {
		v := ev.Values[i]
		if col < 0 {
			if !v.Missing() {
				t.Fatalf("%q: value %d should be missing: %+v", m, i, v)
			}
			continue
		}
		if w := ev.Tuple[col]; v.Kind != w.Kind || !bytes.Equal(v.Data, w.Data) {
			t.Fatalf("%q: value %d is %+v, tuple column %d is %+v", m, i, v, col, w)
		}
	}
	for _, v := range ev.Tuple {
		if !bytes.Contains([]byte("nutb"), []byte{v.Kind}) || len(v.Data) > len(m) {
			t.Fatalf("%q: bad tuple value %+v", m, v)
		}
	}
}
