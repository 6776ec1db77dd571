package engine

import "testing"

// Key hashes scope and name with a separator between them: the same bytes
// split another way between scope and name are another lock. Without it,
// tenant "ab"'s key "c" would be tenant "a"'s key "bc", and one tenant's
// request could hold up, or be replayed to, another's.
func TestKeySeparatesScopeFromName(t *testing.T) {
	for _, pair := range [][2][2]string{
		{{"ab", "c"}, {"a", "bc"}},
		{{"abc", ""}, {"", "abc"}},
		{{"abc", ""}, {"ab", "c"}},
		{{"tenant-1", "order-2"}, {"tenant-1order-", "2"}},
		{{"", "x"}, {"x", ""}},
	} {
		a, b := pair[0], pair[1]
		ka, kb := Key("p:", a[0], a[1]), Key("p:", b[0], b[1])
		if ka == kb {
			t.Errorf("Key(scope %q, name %q) = Key(scope %q, name %q) = %s: want two locks", a[0], a[1], b[0], b[1], ka)
		}
		// Neither is the key of the two joined with nothing between.
		if joined := Key("p:", "", a[0]+a[1]); ka == joined && a[0] != "" {
			t.Errorf("Key(scope %q, name %q) is the key of name %q alone", a[0], a[1], a[0]+a[1])
		}
	}
}
