package dbconn

import "testing"

func TestModeNamedFindsTheParameterInURLsAndKeywordStrings(t *testing.T) {
	for _, tc := range []struct {
		conn string
		want bool
	}{
		{"postgres://app@db:5432/orders?sslmode=disable", false},
		{"postgres://app@db:5432/orders?sslmode=disable&default_query_exec_mode=exec", true},
		{"postgresql://app@db/orders?default_query_exec_mode=cache_statement", true},
		{"postgres://app@db/default_query_exec_mode", false},
		{"host=db user=app dbname=orders", false},
		{"host=db default_query_exec_mode=exec", true},
		{"default_query_exec_mode = exec host=db", true},
		{"host=db application_name=my_default_query_exec_mode=x", false},
	} {
		if got := modeNamed(tc.conn); got != tc.want {
			t.Errorf("modeNamed(%q) = %v, want %v", tc.conn, got, tc.want)
		}
	}
}
