package pgerr

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

func TestIsUndefinedTable(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{&pgconn.PgError{Code: "42P01"}, true},
		{fmt.Errorf("reading: %w", &pgconn.PgError{Code: "42P01"}), true},
		{&pgconn.PgError{Code: "42501"}, false}, // insufficient_privilege
		{errors.New("42P01"), false},
		{nil, false},
	} {
		if got := IsUndefinedTable(c.err); got != c.want {
			t.Errorf("IsUndefinedTable(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
