package domain

// CommandFieldNames lists the body fields a client command of type t takes
// besides idempotency_key, in the decoder's order (nil for a type that is not
// a client command): the schema the Go client's structs are checked against.
func CommandFieldNames(t CommandType) []string {
	specs, ok := commandFields[t]
	if !ok {
		return nil
	}
	out := make([]string, len(specs))
	for i, s := range specs {
		out[i] = s.name
	}
	return out
}
