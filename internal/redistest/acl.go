package redistest

import (
	"context"
	"crypto/tls"
	"errors"
	"strings"
)

// SetACLUser creates or changes an ACL user from a line in ACL-file form,
// "user caddy on >secret ~redis_lock:* +eval +evalsha", so that tests can
// check the plugin works with (and only with) the permissions it documents.
// Fields are split on spaces: a password cannot contain one. The leading
// "user" is optional.
func SetACLUser(ctx context.Context, addr string, tlsConf *tls.Config, line string) error {
	f := strings.Fields(line)
	if len(f) > 0 && f[0] == "user" {
		f = f[1:]
	}
	if len(f) == 0 {
		return errors.New("redistest: ACL line without a user name")
	}
	_, err := Do(ctx, addr, tlsConf, append([]string{"ACL", "SETUSER"}, f...)...)
	return err
}

// DeleteACLUser removes an ACL user.
func DeleteACLUser(ctx context.Context, addr string, tlsConf *tls.Config, name string) error {
	_, err := Do(ctx, addr, tlsConf, "ACL", "DELUSER", name)
	return err
}
