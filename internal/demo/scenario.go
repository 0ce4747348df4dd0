package demo

import (
	"encoding/json"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/seqinbox/seqinbox/internal/sequence"
)

// Event is one logical message the order service emits: a CloudEvent with its own ce_id.
// Resending it (a duplicate) produces the same record again.
type Event struct {
	OrderID string
	// Type and Subtype make the qualified type; Subtype travels in the ce_validationresult header.
	Type, Subtype string
	// ID is the ce_id, the idempotence ID.
	ID string
	// Test marks a smoke-test order ("test": true), which the sample's filter does not sequence.
	Test bool
}

// Qualified is the event's qualified type, as the declaration names it.
func (e *Event) Qualified() string { return sequence.Qualify(e.Type, e.Subtype) }

// Send is one record the scenario produces: an event on a partition, or a poison record.
type Send struct {
	// Event is nil for a poison record.
	Event *Event
	// Poison is the raw record of a poison send: headers and a value that cannot be processed.
	Poison *Poison
	// Partition of the orders topic the record is written to.
	Partition int32
}

// Poison is a record that no consumer can process; it must end in the dead-letter topic.
type Poison struct {
	// ID is its ce_id, so that the report can find it in the dead-letter topic.
	ID string
	// OrderID is the order it claims to belong to, for the report.
	OrderID string
	// Why says what is wrong with it, for the report.
	Why     string
	Headers []kgo.RecordHeader
	Value   []byte
}

// Scenario is what the demo sends and what it expects.
type Scenario struct {
	// Topic and Partitions of the records.
	Topic      string
	Partitions int32
	// Sends in production order.
	Sends []Send
	// RejectOnce is the ce_id the demo sink answers with 500 the first time it receives it.
	RejectOnce string
}

// Source is the ce_source of every scenario event.
const Source = "/demo/order-service"

// The orders of the scenario, each showing one thing the claim engine does.
const (
	// orderReversed arrives in reverse order: delivered, shipped, validated, paid, created.
	orderReversed = "order-1001"
	// orderDuplicated has its created, paid and delivered events sent twice, across partitions.
	orderDuplicated = "order-1002"
	// orderRejected is shipped before it is paid; the sink rejects its payment once.
	orderRejected = "order-1003"
	// orderOutOfStock is validated OUT_OF_STOCK, a subtype the sample does not declare.
	orderOutOfStock = "order-1004"
	// orderTruncated has a payment event whose payload was cut off: a poison record.
	orderTruncated = "order-1005"
	// orderTest is a smoke-test order, delivered without sequencing.
	orderTest = "order-9001"
)

// OrderScenario is the demo's scenario for the sample declaration's sequence `order`, on a topic
// with three partitions. Each order normally goes to one partition, as a key-hash partitioner
// would put it; duplicates are sent to another partition, so that the consumers of different
// partitions race for them.
func OrderScenario(topic string) *Scenario {
	ev := func(order, typ, subtype, suffix string) *Event {
		return &Event{OrderID: order, Type: typ, Subtype: subtype, ID: "evt-" + order[len("order-"):] + "-" + suffix}
	}
	created := func(o string) *Event { return ev(o, "OrderCreated", "", "created") }
	validated := func(o string) *Event { return ev(o, "OrderValidated", "STOCK_AVAILABLE", "validated") }
	paid := func(o string) *Event { return ev(o, "OrderPaid", "", "paid") }
	shipped := func(o string) *Event { return ev(o, "OrderShipped", "", "shipped") }
	delivered := func(o string) *Event { return ev(o, "OrderDelivered", "", "delivered") }

	r1, r2, r3 := created(orderReversed), validated(orderReversed), paid(orderReversed)
	r4, r5 := shipped(orderReversed), delivered(orderReversed)
	d1, d2, d3 := created(orderDuplicated), validated(orderDuplicated), paid(orderDuplicated)
	d4, d5 := shipped(orderDuplicated), delivered(orderDuplicated)
	j1, j2, j3 := created(orderRejected), validated(orderRejected), paid(orderRejected)
	j4, j5 := shipped(orderRejected), delivered(orderRejected)
	o1 := created(orderOutOfStock)
	t1 := created(orderTest)
	t1.Test = true

	on := func(p int32, e *Event) Send { return Send{Event: e, Partition: p} }
	return &Scenario{
		Topic:      topic,
		Partitions: 3,
		RejectOnce: j3.ID,
		Sends: []Send{
			on(0, r5), on(0, r4), on(0, r2), on(0, r3),
			on(1, d1), on(2, d1),
			on(1, j4), on(1, j1),
			on(0, r1),
			on(1, d2), on(1, d3), on(0, d3),
			on(2, t1),
			on(1, j3), on(1, j2),
			on(1, d4), on(1, d5), on(1, d5),
			{Poison: &Poison{
				ID:      "evt-1005-paid",
				OrderID: orderTruncated,
				Why:     "its payload is truncated JSON",
				Headers: ceHeaders("OrderPaid", "evt-1005-paid", ""),
				Value:   []byte(`{"orderId": "order-1005", "amount": 59.`),
			}, Partition: 1},
			on(1, j5),
			on(2, o1),
			{Poison: &Poison{
				ID:      "evt-1004-validated",
				OrderID: orderOutOfStock,
				Why:     "its validation result OUT_OF_STOCK is not a declared subtype",
				Headers: ceHeaders("OrderValidated", "evt-1004-validated", "OUT_OF_STOCK"),
				Value:   payload(orderOutOfStock, false),
			}, Partition: 2},
		},
	}
}

// Events returns the distinct logical messages of the scenario, in first-send order.
func (s *Scenario) Events() []*Event {
	seen := map[*Event]bool{}
	var out []*Event
	for _, send := range s.Sends {
		if send.Event != nil && !seen[send.Event] {
			seen[send.Event] = true
			out = append(out, send.Event)
		}
	}
	return out
}

// Records renders the sends as Kafka records in CloudEvents binary mode, keyed by order.
func (s *Scenario) Records() []*kgo.Record {
	out := make([]*kgo.Record, 0, len(s.Sends))
	for _, send := range s.Sends {
		rec := &kgo.Record{Topic: s.Topic, Partition: send.Partition}
		if send.Poison != nil {
			rec.Headers, rec.Value = send.Poison.Headers, send.Poison.Value
		} else {
			e := send.Event
			rec.Key = []byte(e.OrderID)
			rec.Headers = ceHeaders(e.Type, e.ID, e.Subtype)
			rec.Value = payload(e.OrderID, e.Test)
		}
		out = append(out, rec)
	}
	return out
}

// ceHeaders are the CloudEvents Kafka binary-mode headers of an event; the subtype of
// OrderValidated travels in the header the sample reads it from.
func ceHeaders(typ, id, subtype string) []kgo.RecordHeader {
	hs := []kgo.RecordHeader{
		{Key: "ce_specversion", Value: []byte("1.0")},
		{Key: "ce_id", Value: []byte(id)},
		{Key: "ce_type", Value: []byte(typ)},
		{Key: "ce_source", Value: []byte(Source)},
		{Key: "content-type", Value: []byte("application/json")},
	}
	if subtype != "" {
		hs = append(hs, kgo.RecordHeader{Key: "ce_validationresult", Value: []byte(subtype)})
	}
	return hs
}

// orderPayload is the JSON payload of every scenario event.
type orderPayload struct {
	OrderID string `json:"orderId"`
	Test    bool   `json:"test,omitempty"`
}

func payload(orderID string, test bool) []byte {
	// A struct of a string and a bool always marshals.
	data, _ := json.Marshal(orderPayload{OrderID: orderID, Test: test})
	return data
}
