package sink

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kslog"
)

// TestQuietLogger: the retried metadata wait of a topic that does not exist
// yet is logged at debug; the same message with another error, and the
// wait's failure for good, stay at info.
func TestQuietLogger(t *testing.T) {
	var buf bytes.Buffer
	l := quietLogger{kslog.New(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo})))}
	l.Log(kgo.LogLevelInfo, "new topic metadata wait failed, retrying wait", "topic", "t1", "err", kerr.UnknownTopicOrPartition)
	l.Log(kgo.LogLevelInfo, "new topic metadata wait failed, retrying wait", "topic", "t2", "err", kerr.TopicAuthorizationFailed)
	l.Log(kgo.LogLevelInfo, "new topic metadata wait failed, done retrying, failing all records", "topic", "t3", "err", kerr.UnknownTopicOrPartition)
	out := buf.String()
	if strings.Contains(out, "topic=t1") || !strings.Contains(out, "topic=t2") || !strings.Contains(out, "topic=t3") {
		t.Errorf("log at info:\n%s", out)
	}
}
