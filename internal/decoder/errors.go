package decoder

import (
	"errors"
	"fmt"
)

// Every error Decode returns is a *MessageError wrapping one of these, so
// callers can branch with errors.Is and still log a precise message.
var (
	// ErrTruncated means the message ended before a field it must contain.
	ErrTruncated = errors.New("message truncated")

	// ErrMalformed means the message has all its bytes but they do not fit
	// the format: an unknown tuple marker or column kind, a negative length,
	// a tuple whose column count differs from its relation's, or bytes left
	// over after the last field.
	ErrMalformed = errors.New("malformed message")

	// ErrUnknownRelation means an Insert, Update or Delete named a relation
	// id that no Relation message has described. pgoutput always sends the
	// Relation first, so this means messages were lost or reordered, and
	// the change cannot be interpreted.
	ErrUnknownRelation = errors.New("unknown relation")

	// ErrUnknownMessageType means the first byte is not a pgoutput protocol
	// version 1 message type. It is an error rather than an ignored message
	// because the likely causes (a newer protocol version or streaming mode
	// negotiated by mistake, or a corrupt stream) could hide inserts.
	ErrUnknownMessageType = errors.New("unknown message type")
)

// MessageError describes why one message could not be decoded.
type MessageError struct {
	Type   byte   // the message type byte ('I', 'R', ...); 0 for an empty message
	Offset int    // byte offset in the message where the problem was found
	Detail string // what was being read and what was wrong with it
	Err    error  // one of the Err* sentinels above
}

func (e *MessageError) Error() string {
	return fmt.Sprintf("decoder: %s message: %s (offset %d): %v", typeName(e.Type), e.Detail, e.Offset, e.Err)
}

// Unwrap lets errors.Is match the sentinel.
func (e *MessageError) Unwrap() error { return e.Err }

// typeName names a message type the way the PostgreSQL documentation does,
// so an error can be matched against the protocol description.
func typeName(t byte) string {
	switch t {
	case 'B':
		return "Begin"
	case 'C':
		return "Commit"
	case 'O':
		return "Origin"
	case 'R':
		return "Relation"
	case 'Y':
		return "Type"
	case 'I':
		return "Insert"
	case 'U':
		return "Update"
	case 'D':
		return "Delete"
	case 'T':
		return "Truncate"
	case 'M':
		return "logical decoding Message"
	case 0:
		return "empty"
	}
	return fmt.Sprintf("%q", t)
}
