package wire

import (
	"fmt"
	"unicode/utf8"
)

// MetadataEntry is one key/value pair; a key ending in "-bin" has a binary value.
type MetadataEntry struct {
	Key   string
	Value string
}

// Metadata is a metadata block: entries in wire order, keys may repeat (§5.1).
type Metadata []MetadataEntry

// Get returns the first value of key.
func (m Metadata) Get(key string) (string, bool) {
	for _, e := range m {
		if e.Key == key {
			return e.Value, true
		}
	}
	return "", false
}

// Size is the block's encoded length: 2 + Σ(3 + key + value).
func (m Metadata) Size() int {
	n := 2
	for _, e := range m {
		n += 3 + len(e.Key) + len(e.Value)
	}
	return n
}

// ValidKey reports whether k is a legal metadata key (1..=255 bytes of 0-9 a-z - _ .).
func ValidKey(k string) bool {
	if len(k) == 0 || len(k) > 255 {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

// IsBinaryKey reports whether k's value is binary (the key ends in "-bin").
func IsBinaryKey(k string) bool { return len(k) >= 4 && k[len(k)-4:] == "-bin" }

// Validate checks keys and text values as a receiver would.
func (m Metadata) Validate() error {
	if len(m) > 65535 {
		return fmt.Errorf("metadata: %d entries, at most 65535", len(m))
	}
	for _, e := range m {
		if !ValidKey(e.Key) {
			return fmt.Errorf("metadata: invalid key %q (1..=255 bytes of 0-9 a-z - _ .)", e.Key)
		}
		if len(e.Value) > 65535 {
			return fmt.Errorf("metadata: value of %q is %d bytes, at most 65535", e.Key, len(e.Value))
		}
		if !IsBinaryKey(e.Key) && !utf8.ValidString(e.Value) {
			return fmt.Errorf("metadata: text value of %q is not UTF-8", e.Key)
		}
	}
	return nil
}
