package redistest

import (
	"bufio"
	"reflect"
	"strings"
	"testing"
)

func TestReadReply(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want any
	}{
		{"+OK\r\n", "OK"},
		{":42\r\n", int64(42)},
		{"$5\r\nhe\r\no\r\n", "he\r\no"},
		{"$-1\r\n", nil},
		{"*-1\r\n", nil},
		{"*3\r\n$3\r\nfoo\r\n:1\r\n*1\r\n+x\r\n", []any{"foo", int64(1), []any{"x"}}},
		{"-MOVED 866 127.0.0.1:7001\r\n", &Error{Msg: "MOVED 866 127.0.0.1:7001"}},
	} {
		got, err := readReply(bufio.NewReader(strings.NewReader(tc.in)))
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%q: %#v %v, want %#v", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "+OK\n", "?x\r\n", "$5\r\nab\r\n", ":x\r\n"} {
		if got, err := readReply(bufio.NewReader(strings.NewReader(bad))); err == nil {
			t.Errorf("%q: %#v, want an error", bad, got)
		}
	}
	if p := (&Error{Msg: "NOPERM this user has no permissions"}).Prefix(); p != "NOPERM" {
		t.Errorf("Prefix %q", p)
	}
	if v := InfoField("# Replication\r\nrole:slave\r\nmaster_port:7\r\n", "master_port"); v != "7" {
		t.Errorf("InfoField %q", v)
	}
}
