package mapping

import "time"

// parseTimestamp parses PostgreSQL's DateStyle=ISO text output of a
// timestamptz (withZone: an offset must follow) or a timestamp (no offset;
// taken as UTC):
//
//	YYYY-MM-DD HH:MM:SS[.ffffff][±HH[:MM[:SS]]][ BC]
//
// The year has four or more digits. It is hand-written rather than
// time.Parse because it runs once per row and this is several times faster
// and allocates nothing. The result is in UTC; only the instant matters to
// Kafka.
func parseTimestamp(b []byte, withZone bool) (time.Time, bool) {
	year, i := 0, 0
	for ; i < len(b) && i < 7 && isDigit(b[i]); i++ {
		year = year*10 + int(b[i]-'0')
	}
	// "-MM-DD HH:MM:SS" follows the year; PostgreSQL has no year 0.
	if i < 4 || year == 0 || len(b) < i+15 || b[i] != '-' || b[i+3] != '-' || b[i+6] != ' ' || b[i+9] != ':' || b[i+12] != ':' {
		return time.Time{}, false
	}
	month, ok1 := two(b, i+1)
	day, ok2 := two(b, i+4)
	hour, ok3 := two(b, i+7)
	minute, ok4 := two(b, i+10)
	sec, ok5 := two(b, i+13)
	if !(ok1 && ok2 && ok3 && ok4 && ok5) {
		return time.Time{}, false
	}
	i += 15

	nsec := 0
	if i < len(b) && b[i] == '.' {
		i++
		digits := 0
		for ; i < len(b) && isDigit(b[i]); i++ {
			if digits++; digits > 9 {
				return time.Time{}, false
			}
			nsec = nsec*10 + int(b[i]-'0')
		}
		if digits == 0 {
			return time.Time{}, false
		}
		for ; digits < 9; digits++ {
			nsec *= 10
		}
	}

	offset := 0 // seconds east of UTC
	if i < len(b) && (b[i] == '+' || b[i] == '-') {
		if !withZone {
			return time.Time{}, false
		}
		sign := 1
		if b[i] == '-' {
			sign = -1
		}
		h, ok := two(b, i+1)
		if !ok {
			return time.Time{}, false
		}
		offset, i = h*3600, i+3
		for unit := 60; unit >= 1 && i < len(b) && b[i] == ':'; unit /= 60 {
			v, ok := two(b, i+1)
			if !ok || v > 59 {
				return time.Time{}, false
			}
			offset, i = offset+v*unit, i+3
		}
		offset *= sign
	} else if withZone {
		return time.Time{}, false
	}

	if len(b)-i == 3 && string(b[i:]) == " BC" {
		// PostgreSQL counts 1 BC, 2 BC, ... before 1 AD; time counts 0, -1, ...
		year, i = 1-year, len(b)
	}
	if i != len(b) || month < 1 || month > 12 || day < 1 || day > daysIn(month, year) ||
		hour > 23 || minute > 59 || sec > 59 {
		return time.Time{}, false
	}
	t := time.Date(year, time.Month(month), day, hour, minute, sec, nsec, time.UTC)
	return t.Add(-time.Duration(offset) * time.Second), true
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// two decodes the two digits at b[i:], if there are two.
func two(b []byte, i int) (int, bool) {
	if i+2 > len(b) || !isDigit(b[i]) || !isDigit(b[i+1]) {
		return 0, false
	}
	return int(b[i]-'0')*10 + int(b[i+1]-'0'), true
}

// daysIn is the length of month in the proleptic Gregorian calendar that
// PostgreSQL uses for every year, BC ones included (year 0 is 1 BC).
func daysIn(month, year int) int {
	switch month {
	case 2:
		if year%4 == 0 && (year%100 != 0 || year%400 == 0) {
			return 29
		}
		return 28
	case 4, 6, 9, 11:
		return 30
	}
	return 31
}
