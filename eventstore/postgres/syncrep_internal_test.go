package postgres

import (
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ledgerworks/ledger/internal/platform/pgerr"
)

// TestSyncWaitCancelledIsPrecise: the warnings of a cancelled wait for the
// standby count, under English and translated messages; other notices do not.
func TestSyncWaitCancelledIsPrecise(t *testing.T) {
	const detail = "The transaction has already committed locally, but might not have been replicated to the standby."
	cancelled := pgconn.Notice{SeverityUnlocalized: "WARNING", Code: pgerr.Warning, Message: "canceling wait for synchronous replication due to user request", Detail: detail}
	terminated := pgconn.Notice{SeverityUnlocalized: "WARNING", Code: pgerr.AdminShutdown, Message: "canceling the wait for synchronous replication and terminating connection due to administrator command", Detail: detail}
	translated := pgconn.Notice{SeverityUnlocalized: "WARNING", Code: pgerr.Warning, Message: "Warten auf synchrone Replikation wird abgebrochen"}
	for _, tc := range []struct {
		n       pgconn.Notice
		english bool
		want    bool
	}{
		{cancelled, true, true},
		{terminated, true, true},
		{translated, false, true},
		{translated, true, false}, // an English server says it in English
		{pgconn.Notice{SeverityUnlocalized: "WARNING", Code: pgerr.Warning, Message: "some trigger's warning"}, true, false},
		{pgconn.Notice{SeverityUnlocalized: "NOTICE", Code: "00000", Message: cancelled.Message}, true, false},
		{pgconn.Notice{SeverityUnlocalized: "WARNING", Code: "25P01", Message: "there is no transaction in progress"}, false, false},
	} {
		if got := syncWaitCancelled(&tc.n, tc.english); got != tc.want {
			t.Errorf("%+v (english %v): %v, want %v", tc.n, tc.english, got, tc.want)
		}
	}
	for lc, want := range map[string]bool{"": true, "C": true, "C.UTF-8": true, "en_US.UTF-8": true, "POSIX": true, "de_DE.UTF-8": false, "fr_FR": false} {
		if untranslated(lc) != want {
			t.Errorf("lc_messages %q: untranslated %v, want %v", lc, !want, want)
		}
	}
}
