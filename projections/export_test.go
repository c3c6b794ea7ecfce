package projections

// SetMemoAccountsLimit sets the bound of a rebuild's memo of accounts
// (memoAccountsLimit) until the function it returns restores it.
func SetMemoAccountsLimit(n int) (restore func()) {
	prev := memoAccountsLimit
	memoAccountsLimit = n
	return func() { memoAccountsLimit = prev }
}
