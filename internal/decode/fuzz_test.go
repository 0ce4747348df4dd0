package decode

import (
	"testing"
	"time"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"
)

// FuzzDecode feeds arbitrary ids, payloads and header names to the decoder: it must never panic,
// and a record it accepts for sequencing must carry IDs that PostgreSQL can store and index.
// Seeds are in testdata/fuzz/FuzzDecode.
func FuzzDecode(f *testing.F) {
	d := newDecoder(f)
	f.Add("e-1", "OrderCreated", "", `{"order":{"id":"o-1"}}`, "traceparent", "00-1-2-01", false)
	f.Add("e-2", "ShipmentBooked", "s-1", `{"bookingNo":"b-1"}`, "x", "y", false)
	f.Add("e-3", "OrderCreated", "", `{"specversion":"1.0","id":"e","source":"/s","type":"OrderCreated","data":{"order":{"id":"o"}}}`, "k", "v", true)
	f.Fuzz(func(t *testing.T, id, typ, subject, value, headerKey, headerValue string, structured bool) {
		r := binary("key", value, "id", id, "type", typ, "subject", subject, "result", "OK")
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: headerKey, Value: []byte(headerValue)})
		if structured {
			r.Headers = []kgo.RecordHeader{{Key: ContentTypeHeader, Value: []byte(StructuredContentType)}}
		}
		rec, err := d.Decode(r, time.Now())
		if err != nil || !rec.Sequenced || rec.ContextID == "" {
			return
		}
		for _, v := range []string{rec.Origin.MessageID, rec.ContextID, rec.IdempotenceID} {
			if !utf8.ValidString(v) || len(v) > MaxIDBytes || containsNUL(v) {
				t.Fatalf("accepted an ID PostgreSQL cannot store: %q (record %+v)", v, rec)
			}
		}
	})
}

func containsNUL(s string) bool {
	for i := range len(s) {
		if s[i] == 0 {
			return true
		}
	}
	return false
}
