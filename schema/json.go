package schema

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
)

// mismatch is where and why a payload does not fit a schema; the Encoder
// adds which schema to make it a *MismatchError.
type mismatch struct {
	path   string
	reason string
}

// decodeJSON reads a payload as one JSON value, numbers kept as
// json.Number so that an integer too large for a float64 is not rounded.
func decodeJSON(payload []byte) (any, *mismatch) {
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, &mismatch{"$", "not JSON: " + err.Error()}
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, &mismatch{"$", "not one JSON value: more follows the first"}
	}
	return v, nil
}

// field is the JSON path of a member of the object at path. It is built
// for every member an encoder walks, mismatch or not, so it is a plain
// loop rather than a regular expression.
func field(path, key string) string {
	if plainKey(key) {
		return path + "." + key
	}
	return path + "[" + strconv.Quote(key) + "]"
}

// plainKey: key is an identifier, [A-Za-z_][A-Za-z0-9_]*, written
// $.key in a path rather than $["key"].
func plainKey(key string) bool {
	for i := 0; i < len(key); i++ {
		c := key[i]
		if c == '_' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || i > 0 && '0' <= c && c <= '9' {
			continue
		}
		return false
	}
	return key != ""
}

// element is the JSON path of an element of the array at path.
func element(path string, i int) string { return path + "[" + strconv.Itoa(i) + "]" }

// jsonKind names the JSON type of a decoded value, for reasons.
func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case json.Number:
		return "a number"
	case string:
		return "a string"
	case []any:
		return "an array"
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("%T", v)
}
