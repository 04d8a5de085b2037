// Package token makes the owner tokens of claims and locks.
package token

import (
	"crypto/rand"
	"encoding/hex"
)

// New returns 128 random bits as 32 hex digits: a value no other holder picks,
// so a release or refresh that compares it can never act for someone else.
func New() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+): it crashes instead.
	return hex.EncodeToString(b[:])
}
