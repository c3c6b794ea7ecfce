package projtest

// AtomicBatch is a body of ledger.v1.cmd.batch and the status it gets.
type AtomicBatch struct{ Body, Status string }

// AtomicBatches are atomic batches sent one after another to a fresh ledger:
// one applied over every kind of write (accounts, a transfer, a transaction),
// one applied whose first element was decided before it (a duplicate), one
// refused at its second element, and one refused by its second element
// invalid (recorded as the rejected one is: PROTOCOL.md v1.2 §2.2).
var AtomicBatches = []AtomicBatch{
	{`{"atomic":true,"idempotency_key":"b1","commands":[
		{"type":"open_account","idempotency_key":"o-a","account_id":"a","currency":"EUR"},
		{"type":"deposit","idempotency_key":"d-a","account_id":"a","amount":100,"currency":"EUR"},
		{"type":"open_account","idempotency_key":"o-b","account_id":"b","currency":"EUR"},
		{"type":"transfer","idempotency_key":"t-1","transfer_id":"t-1","from":"a","to":"b","amount":40,"currency":"EUR"},
		{"type":"post_transaction","idempotency_key":"x-1","transaction_id":"x-1","postings":[{"from":"b","to":"a","amount":10,"currency":"EUR"}]}]}`, "applied"},
	{`{"atomic":true,"idempotency_key":"b2","commands":[
		{"type":"deposit","idempotency_key":"d-a","account_id":"a","amount":100,"currency":"EUR"},
		{"type":"deposit","idempotency_key":"d-b","account_id":"b","amount":1,"currency":"EUR"}]}`, "applied"},
	{`{"atomic":true,"idempotency_key":"b3","commands":[
		{"type":"deposit","idempotency_key":"d-c","account_id":"b","amount":1,"currency":"EUR"},
		{"type":"withdraw","idempotency_key":"w-a","account_id":"a","amount":1000,"currency":"EUR"}]}`, "rejected"},
	{`{"atomic":true,"idempotency_key":"b4","commands":[
		{"type":"deposit","idempotency_key":"d-d","account_id":"b","amount":1,"currency":"EUR"},
		{"type":"deposit","idempotency_key":"d-e","account_id":"a","amount":0,"currency":"EUR"}]}`, "invalid"},
}
