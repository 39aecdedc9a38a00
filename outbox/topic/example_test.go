package topic_test

import (
	"fmt"

	"github.com/cdc-outbox/cdc-outbox/outbox/topic"
)

func ExampleCheck() {
	fmt.Println(topic.Check("outbox.event.payment"))
	fmt.Println(topic.Check("outbox.event.payments/eu"))
	// Output:
	// <nil>
	// topic "outbox.event.payments/eu" contains '/'; Kafka topic names allow only a-z, A-Z, 0-9, '.', '_' and '-'
}

// The streamer and package outbox render a template the same way.
func ExampleTemplate_Render() {
	tmpl, err := topic.ParseTemplate(topic.DefaultTemplate)
	if err != nil {
		panic(err)
	}
	for _, aggregateType := range []string{"payment", "payment refund"} {
		name, err := tmpl.Render(func(column string) string {
			if column == "aggregate_type" {
				return aggregateType
			}
			return ""
		})
		fmt.Printf("%q %v\n", name, err)
	}
	// Output:
	// "outbox.event.payment" <nil>
	// "" topic "outbox.event.payment refund" contains ' '; Kafka topic names allow only a-z, A-Z, 0-9, '.', '_' and '-'
}
