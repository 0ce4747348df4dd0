// Command producer sends the events of one order to the sample inbox
// (config/samples/inbox_v1alpha1_sequentialinbox.yaml) as CloudEvents in Kafka binary mode, and
// out of order: the inbox hands them to the service as OrderCreated, OrderPaid.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

func main() {
	brokers := flag.String("brokers", "127.0.0.1:9092", "comma-separated Kafka brokers")
	orderID := flag.String("order", "42", "the order ID: the context ID of the events")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := produce(ctx, strings.Split(*brokers, ","), *orderID); err != nil {
		fmt.Fprintln(os.Stderr, "producer:", err)
		os.Exit(1)
	}
}

// produce sends OrderPaid before OrderCreated to the topic orders and waits for the brokers'
// acknowledgement.
func produce(ctx context.Context, brokers []string, orderID string) error {
	client, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic("orders"))
	if err != nil {
		return err
	}
	defer client.Close()
	return client.ProduceSync(ctx, orderEvents(orderID)...).FirstErr()
}

// orderEvents are the events of one order, each a CloudEvent in binary mode: the attributes in
// ce_ headers, the JSON payload as the value, and the order ID as the key, so that all events of
// an order go to one partition. The CloudEvent id is the idempotence ID: a resend with the same
// id is a duplicate, which the inbox acknowledges without a second delivery.
func orderEvents(orderID string) []*kgo.Record {
	event := func(eventType, id string) *kgo.Record {
		payload, _ := json.Marshal(map[string]string{"orderId": orderID})
		return &kgo.Record{
			Key:   []byte(orderID),
			Value: payload,
			Headers: []kgo.RecordHeader{
				{Key: "ce_specversion", Value: []byte("1.0")},
				{Key: "ce_id", Value: []byte(id)},
				{Key: "ce_source", Value: []byte("/shop/checkout")},
				{Key: "ce_type", Value: []byte(eventType)},
				{Key: "content-type", Value: []byte("application/json")},
			},
		}
	}
	return []*kgo.Record{
		event("OrderPaid", "paid-"+orderID),
		event("OrderCreated", "created-"+orderID),
	}
}
