package mapping

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// pgFormat prints t as PostgreSQL does with DateStyle ISO in a session whose
// zone has offset off seconds: fraction without trailing zeros, offset as
// +HH, +HH:MM or +HH:MM:SS.
func pgFormat(t time.Time, off int, withZone bool) string {
	t = t.In(time.FixedZone("", off))
	s := fmt.Sprintf("%04d-%02d-%02d %02d:%02d:%02d", t.Year(), t.Month(), t.Day(), t.Hour(), t.Minute(), t.Second())
	if ns := t.Nanosecond(); ns != 0 {
		s += strings.TrimRight(fmt.Sprintf(".%09d", ns), "0")
	}
	if !withZone {
		return s
	}
	sign := '+'
	if off < 0 {
		sign, off = '-', -off
	}
	s += fmt.Sprintf("%c%02d", sign, off/3600)
	if off%3600 != 0 {
		s += fmt.Sprintf(":%02d", off/60%60)
		if off%60 != 0 {
			s += fmt.Sprintf(":%02d", off%60)
		}
	}
	return s
}

// goLayouts are time.Parse layouts covering each offset form.
var goLayouts = []string{
	"2006-01-02 15:04:05.999999999-07",
	"2006-01-02 15:04:05.999999999-07:00",
	"2006-01-02 15:04:05.999999999-07:00:00",
}

func goParse(s string, withZone bool) (time.Time, error) {
	if !withZone {
		return time.Parse("2006-01-02 15:04:05.999999999", s)
	}
	var err error
	for _, l := range goLayouts {
		var t time.Time
		if t, err = time.Parse(l, s); err == nil {
			return t, nil
		}
	}
	return time.Time{}, err
}

// TestParseTimestampMatchesTimeParse checks the hand-written parser against
// time.Parse on many PostgreSQL-formatted values.
func TestParseTimestampMatchesTimeParse(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 20000 {
		// Microsecond precision like PostgreSQL, with some whole seconds.
		sec := rng.Int64N(time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC).Unix()-time.Date(1, 1, 2, 0, 0, 0, 0, time.UTC).Unix()) +
			time.Date(1, 1, 2, 0, 0, 0, 0, time.UTC).Unix()
		ns := rng.Int64N(1e6) * 1e3
		if i%5 == 0 {
			ns = 0
		}
		tm := time.Unix(sec, ns).UTC()
		var off int
		switch i % 4 {
		case 1:
			off = (rng.IntN(27) - 12) * 3600
		case 2:
			off = (rng.IntN(27)-12)*3600 + []int{30, 45}[rng.IntN(2)]*60
		case 3:
			off = -(rng.IntN(12)*3600 + rng.IntN(60)*60 + 1 + rng.IntN(59)) // LMT-style
		}
		withZone := i%7 != 0
		s := pgFormat(tm, off, withZone)
		got, ok := parseTimestamp([]byte(s), withZone)
		want, err := goParse(s, withZone)
		if err != nil {
			t.Fatalf("time.Parse(%q): %v", s, err)
		}
		if !ok || !got.Equal(want) {
			t.Fatalf("parseTimestamp(%q) = %v, %v; time.Parse = %v", s, got, ok, want)
		}
		if withZone && !got.Equal(tm) {
			t.Fatalf("parseTimestamp(%q) = %v, want %v", s, got, tm)
		}
	}
}

func TestParseTimestamp(t *testing.T) {
	for _, tc := range []struct {
		in       string
		withZone bool
		want     time.Time // zero: must fail
	}{
		{"2026-12-01 00:22:33.123456+00", true, time.Date(2026, 12, 1, 0, 22, 33, 123456000, time.UTC)},
		{"2026-12-01 00:22:33+05:30", true, time.Date(2026, 11, 30, 18, 52, 33, 0, time.UTC)},
		{"2026-12-01 00:22:33.5-08", true, time.Date(2026, 12, 1, 8, 22, 33, 5e8, time.UTC)},
		{"1883-11-18 12:00:00-04:56:02", true, time.Date(1883, 11, 18, 16, 56, 2, 0, time.UTC)},
		{"2026-12-01 00:22:33.123456", false, time.Date(2026, 12, 1, 0, 22, 33, 123456000, time.UTC)},
		{"2026-12-01 00:22:33.123456789", false, time.Date(2026, 12, 1, 0, 22, 33, 123456789, time.UTC)},
		{"2024-02-29 00:00:00+00", true, time.Date(2024, 2, 29, 0, 0, 0, 0, time.UTC)},
		{"2000-02-29 00:00:00", false, time.Date(2000, 2, 29, 0, 0, 0, 0, time.UTC)},
		{"0001-01-01 00:00:01+00", true, time.Date(1, 1, 1, 0, 0, 1, 0, time.UTC)}, // 00:00:00 would be the zero Time
		{"0044-03-15 12:00:00+00 BC", true, time.Date(-43, 3, 15, 12, 0, 0, 0, time.UTC)},
		{"0001-02-29 00:00:00 BC", false, time.Date(0, 2, 29, 0, 0, 0, 0, time.UTC)}, // 1 BC is a leap year
		{"294276-12-31 23:59:59.999999+00", true, time.Date(294276, 12, 31, 23, 59, 59, 999999000, time.UTC)},
		{"10000-01-01 00:00:00", false, time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)},

		{"", true, time.Time{}},
		{"infinity", true, time.Time{}},
		{"-infinity", false, time.Time{}},
		{"2026-12-01 00:22:33", true, time.Time{}},     // timestamptz needs an offset
		{"2026-12-01 00:22:33+00", false, time.Time{}}, // timestamp has none
		{"2026-12-01T00:22:33+00", true, time.Time{}},
		{"2026-12-01 00:22:33.+00", true, time.Time{}},
		{"2026-12-01 00:22:33.1234567890+00", true, time.Time{}},
		{"2026-12-01 00:22:33+0", true, time.Time{}},
		{"2026-12-01 00:22:33+00:6", true, time.Time{}},
		{"2026-12-01 00:22:33+00:60", true, time.Time{}},
		{"2026-12-01 00:22:33+00 AD", true, time.Time{}},
		{"2026-12-01 00:22:33+00 BC ", true, time.Time{}},
		{"2023-02-29 00:00:00+00", true, time.Time{}},
		{"1900-02-29 00:00:00+00", true, time.Time{}},
		{"2026-04-31 00:00:00+00", true, time.Time{}},
		{"2026-13-01 00:00:00+00", true, time.Time{}},
		{"2026-00-01 00:00:00+00", true, time.Time{}},
		{"2026-12-00 00:00:00+00", true, time.Time{}},
		{"2026-12-01 24:00:00+00", true, time.Time{}},
		{"2026-12-01 00:60:00+00", true, time.Time{}},
		{"2026-12-01 00:00:60+00", true, time.Time{}},
		{"0000-01-01 00:00:00+00", true, time.Time{}},
		{"226-12-01 00:22:33+00", true, time.Time{}},
		{"12345678-12-01 00:22:33+00", true, time.Time{}},
		{"2026-1a-01 00:22:33+00", true, time.Time{}},
		{"12/01/2026 00:22:33.123456 UTC", true, time.Time{}},
	} {
		got, ok := parseTimestamp([]byte(tc.in), tc.withZone)
		if ok != !tc.want.IsZero() || !got.Equal(tc.want) {
			t.Errorf("parseTimestamp(%q, %v) = %v, %v; want %v", tc.in, tc.withZone, got, ok, tc.want)
		}
	}
}

func TestParseTimestampAllocs(t *testing.T) {
	b := []byte("2026-12-01 00:22:33.123456+05:30")
	if n := testing.AllocsPerRun(100, func() { parseTimestamp(b, true) }); n != 0 {
		t.Errorf("parseTimestamp allocates %v times", n)
	}
}
