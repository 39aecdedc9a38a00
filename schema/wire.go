package schema

import "github.com/twmb/franz-go/pkg/sr"

// header writes the Confluent wire format's header: magic byte 0, the
// schema id (four bytes, big-endian) and, for Protobuf, the message
// indexes (zig-zag varints; [0] is the single byte 0).
var header sr.ConfluentHeader

// appendWire appends a record value in the Confluent wire format to b:
// the header of id (and index for Protobuf), then body.
func appendWire(b []byte, id int, index []int, body []byte) ([]byte, error) {
	b, err := header.AppendEncode(b, id, index)
	if err != nil {
		return nil, err
	}
	return append(b, body...), nil
}
