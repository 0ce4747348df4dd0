package v1alpha1_test

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
)

// TestDurationKeepsWhatIsNoDurationAndWritesItBackUnchanged: decoding never fails, a malformed
// value is reported by Malformed and encoded exactly as it was read, so that an object written
// back (a finalizer, a status patch) keeps its spec.
func TestDurationKeepsWhatIsNoDurationAndWritesItBackUnchanged(t *testing.T) {
	tests := []struct {
		json          string
		want          time.Duration
		wantMalformed string
	}{
		{json: `"10s"`, want: 10 * time.Second},
		{json: `"1h30m"`, want: 90 * time.Minute},
		{json: `"tenseconds"`, wantMalformed: "tenseconds"},
		{json: `""`, wantMalformed: ""},
		{json: `"10"`, wantMalformed: "10"},
		{json: `30`, wantMalformed: "30"},
		{json: `{"seconds":1}`, wantMalformed: `{"seconds":1}`},
	}
	for _, tt := range tests {
		t.Run(tt.json, func(t *testing.T) {
			var d v1alpha1.Duration
			if err := json.Unmarshal([]byte(tt.json), &d); err != nil {
				t.Fatalf("decode %s: %v", tt.json, err)
			}
			written, malformed := d.Malformed()
			isMalformed := tt.want == 0
			if d.Duration != tt.want || malformed != isMalformed || written != tt.wantMalformed {
				t.Fatalf("decode %s = %s, Malformed() = %q, %v; want %s, %q, %v", tt.json, d.Duration, written, malformed, tt.want, tt.wantMalformed, isMalformed)
			}
			out, err := json.Marshal(d)
			if err != nil {
				t.Fatal(err)
			}
			if isMalformed && string(out) != tt.json {
				t.Errorf("encode of malformed %s = %s, want it unchanged", tt.json, out)
			}
			if !isMalformed && string(out) != `"`+tt.want.String()+`"` {
				t.Errorf("encode of %s = %s, want %q", tt.json, out, tt.want.String())
			}
		})
	}
	var d v1alpha1.Duration
	if err := json.Unmarshal([]byte(`null`), &d); err != nil || d != (v1alpha1.Duration{}) {
		t.Errorf("decode null = %+v, %v; want the zero duration", d, err)
	}
}

// TestNoSpecFieldIsAMetav1Duration: a metav1.Duration anywhere in the spec would bring back the
// failure Duration exists to prevent (one malformed stored value stops the operator's cache).
func TestNoSpecFieldIsAMetav1Duration(t *testing.T) {
	forbidden := reflect.TypeFor[metav1.Duration]()
	seen := map[reflect.Type]bool{}
	var walk func(typ reflect.Type, path string)
	walk = func(typ reflect.Type, path string) {
		for typ.Kind() == reflect.Pointer || typ.Kind() == reflect.Slice || typ.Kind() == reflect.Map {
			typ = typ.Elem()
		}
		if typ == forbidden {
			t.Errorf("%s is a metav1.Duration; use v1alpha1.Duration", path)
		}
		if typ.Kind() != reflect.Struct || seen[typ] || typ.PkgPath() != reflect.TypeFor[v1alpha1.Duration]().PkgPath() {
			return
		}
		seen[typ] = true
		for f := range typ.Fields() {
			walk(f.Type, path+"."+f.Name)
		}
	}
	walk(reflect.TypeFor[v1alpha1.SequentialInboxSpec](), "spec")
	walk(reflect.TypeFor[v1alpha1.SequentialInboxActionSpec](), "action spec")
}
