package kurrenttest

// What the server's tests check of its internals. The tests are package
// kurrenttest_test: they use internal/testing/devtest, which imports this
// package for the KurrentDB backend of the tests' stores.
var UUIDToProto = uuidToProto

const DeletedStream = deletedStream
