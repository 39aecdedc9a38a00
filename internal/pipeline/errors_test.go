package pipeline

import (
	"fmt"
	"io"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
)

// TestRecordRefused: refusals that concern the record are told from those
// that concern the cluster, wrapped or not.
func TestRecordRefused(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{kerr.MessageTooLarge, true},
		{fmt.Errorf("%w (uncompressed_bytes=5000)", kerr.MessageTooLarge), true},
		{kerr.RecordListTooLarge, true},
		{kerr.InvalidTimestamp, true},
		{kerr.InvalidRecord, true},
		{kerr.CorruptMessage, true},
		{kerr.InvalidTopicException, true},
		{kerr.TopicAuthorizationFailed, false},
		{kerr.UnknownTopicOrPartition, false},
		{kerr.SaslAuthenticationFailed, false},
		{io.EOF, false},
		{nil, false},
	} {
		if got := recordRefused(tc.err); got != tc.want {
			t.Errorf("recordRefused(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
