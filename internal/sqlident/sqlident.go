// Package sqlident validates and quotes the table and column names that come
// from configuration. Names never come from keys or values: those are always
// bind parameters.
package sqlident

import (
	"fmt"
	"strings"

	"github.com/lib/pq"

	"github.com/contend/contend"
)

// maxLen is PostgreSQL's NAMEDATALEN-1: longer names are silently truncated
// by the server, so two different configured names could meet.
const maxLen = 63

// Quote validates name as a plain identifier, or schema.name, and returns it
// quoted for PostgreSQL. A plain identifier is a letter or underscore followed
// by letters, digits and underscores; anything else (spaces, quotes,
// semicolons) is refused rather than escaped, because such a name in
// configuration is far more likely an injection or a typo than a real table.
func Quote(what, name string) (string, error) {
	parts := strings.Split(name, ".")
	if len(parts) > 2 {
		return "", fmt.Errorf("%s %q: at most one dot (schema.name) allowed: %w", what, name, contend.ErrInvalid)
	}
	for i, p := range parts {
		if err := check(p); err != nil {
			return "", fmt.Errorf("%s %q: %s: %w", what, name, err, contend.ErrInvalid)
		}
		parts[i] = pq.QuoteIdentifier(p)
	}
	return strings.Join(parts, "."), nil
}

func check(s string) error {
	if s == "" {
		return fmt.Errorf("empty name")
	}
	if len(s) > maxLen {
		return fmt.Errorf("longer than %d bytes", maxLen)
	}
	for i, r := range s {
		switch {
		case r == '_', 'a' <= r && r <= 'z', 'A' <= r && r <= 'Z':
		case '0' <= r && r <= '9' && i > 0:
		default:
			return fmt.Errorf("%q at byte %d is not a letter, digit or underscore", r, i)
		}
	}
	return nil
}
