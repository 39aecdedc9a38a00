package sink

import (
	"errors"
	"strings"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// quietLogger is franz-go's logger with the expected noise of producing to
// a topic that does not exist yet moved down to debug: until the broker
// has created it (auto-creation), each wait for its metadata fails with
// UNKNOWN_TOPIC_OR_PARTITION and is retried, and franz-go says so at info
// for every new topic. Its failure for good stays at info (and the
// records' promises report it).
type quietLogger struct{ kgo.Logger }

func (l quietLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	if level == kgo.LogLevelInfo && strings.HasPrefix(msg, "new topic metadata wait failed, retrying") && unknownTopic(keyvals) {
		level = kgo.LogLevelDebug
	}
	l.Logger.Log(level, msg, keyvals...)
}

// unknownTopic reports whether the "err" of keyvals is
// UNKNOWN_TOPIC_OR_PARTITION.
func unknownTopic(keyvals []any) bool {
	for i := 0; i+1 < len(keyvals); i += 2 {
		if k, ok := keyvals[i].(string); ok && k == "err" {
			err, _ := keyvals[i+1].(error)
			return errors.Is(err, kerr.UnknownTopicOrPartition)
		}
	}
	return false
}
