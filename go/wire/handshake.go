package wire

// readPreface checks the peer's preface at the start of b (§2). It returns 8 once the whole
// preface is in, and 0 while it is incomplete but right so far.
func (c *Conn) readPreface(b []byte) (int, *Error) {
	for i := 0; i < min(7, len(b)); i++ {
		if b[i] != Preface[i] {
			return 0, c.fail(perr(BadPreface, "the peer did not start with the topspin preface"), true, false)
		}
	}
	if len(b) < 8 {
		return 0, nil
	}
	if b[7] != Preface[7] {
		return 0, c.fail(perr(UnsupportedVersion, "protocol version %d; this peer speaks version 1 only", b[7]), true, false)
	}
	c.st = stSettings
	return 8, nil
}

// handshake takes the first frame after the preface, which must be SETTINGS (§4).
func (c *Conn) handshake(f *Frame) *Error {
	switch f.Type {
	case TypeSettings:
		peer, err := DefaultSettings().Apply(f.Entries)
		if err != nil {
			return c.fail(err, true, false)
		}
		c.peer = peer
		c.st = stOpen
		c.emit(Event{Type: EvEstablished})
		return nil
	case TypeError:
		return c.fail(&Error{Code: ErrCode(f.Code), Reason: f.Message}, false, false)
	default:
		return c.fail(perr(SettingsError, "first frame is type 0x%02x, not SETTINGS", f.Type), true, false)
	}
}
