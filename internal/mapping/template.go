package mapping

import "github.com/cdc-outbox/cdc-outbox/outbox/topic"

// maxTopicLen and topicChar are Kafka's topic rules, as package topic
// defines them for the streamer and package outbox alike.
const maxTopicLen = topic.MaxLen

func topicChar(c byte) bool { return topic.ValidByte(c) }

// topicPart is a literal piece of the topic template (col < 0) or a
// placeholder naming a column (col is its index in Mapper.Columns()).
type topicPart struct {
	lit  string
	name string
	col  int
}

// parseTopicTemplate splits tmpl into literal parts and {column}
// placeholders, by the rules of package topic, which package outbox applies
// too: an event it accepts is one the streamer can publish.
func parseTopicTemplate(tmpl string) ([]topicPart, error) {
	t, err := topic.ParseTemplate(tmpl)
	if err != nil {
		return nil, err
	}
	var parts []topicPart
	for _, p := range t.Parts() {
		parts = append(parts, topicPart{lit: p.Literal, name: p.Column, col: -1})
	}
	return parts, nil
}

// badTopic says why t is not a legal Kafka topic name, or "" when it is.
func badTopic(t []byte) string {
	if err := topic.Check(t); err != nil {
		return err.(*topic.Error).Reason
	}
	return ""
}
