package wire

// Setting ids (§4).
const (
	SettingMaxFrameSize       uint16 = 1
	SettingMaxConcurrentCalls uint16 = 2
	SettingInitialCallWindow  uint16 = 3
	SettingMaxMessageSize     uint16 = 4
	SettingMaxMetadataSize    uint16 = 5
)

// Settings are one side's receive limits (§4).
type Settings struct {
	MaxFrameSize       uint32
	MaxConcurrentCalls uint32
	InitialCallWindow  uint32
	MaxMessageSize     uint32
	MaxMetadataSize    uint32
}

// DefaultSettings are the values of settings not sent.
func DefaultSettings() Settings {
	return Settings{MaxFrameSize: 16 << 20, MaxConcurrentCalls: 1024, InitialCallWindow: 1 << 20,
		MaxMessageSize: 64 << 20, MaxMetadataSize: 16 << 10}
}

// SettingEntry is one entry of a SETTINGS frame.
type SettingEntry struct {
	ID    uint16
	Value uint32
}

// Apply applies entries in order to s (unknown ids ignored) and checks the ranges.
func (s Settings) Apply(entries []SettingEntry) (Settings, *Error) {
	for _, e := range entries {
		switch e.ID {
		case SettingMaxFrameSize:
			s.MaxFrameSize = e.Value
		case SettingMaxConcurrentCalls:
			s.MaxConcurrentCalls = e.Value
		case SettingInitialCallWindow:
			s.InitialCallWindow = e.Value
		case SettingMaxMessageSize:
			s.MaxMessageSize = e.Value
		case SettingMaxMetadataSize:
			s.MaxMetadataSize = e.Value
		}
	}
	return s, s.Validate()
}

// Validate checks every value against its valid range (§4).
func (s Settings) Validate() *Error {
	switch {
	case s.MaxFrameSize < 16384 || s.MaxFrameSize > MaxWindow:
		return perr(SettingsError, "MAX_FRAME_SIZE %d outside 16384..=2147483647", s.MaxFrameSize)
	case s.MaxConcurrentCalls > MaxWindow:
		return perr(SettingsError, "MAX_CONCURRENT_CALLS %d above 2147483647", s.MaxConcurrentCalls)
	case s.InitialCallWindow > MaxWindow:
		return perr(SettingsError, "INITIAL_CALL_WINDOW %d above 2147483647", s.InitialCallWindow)
	case s.MaxMetadataSize < 4:
		return perr(SettingsError, "MAX_METADATA_SIZE %d below 4", s.MaxMetadataSize)
	}
	return nil
}

// Entries lists all five settings in id order.
func (s Settings) Entries() []SettingEntry {
	return []SettingEntry{{SettingMaxFrameSize, s.MaxFrameSize},
		{SettingMaxConcurrentCalls, s.MaxConcurrentCalls},
		{SettingInitialCallWindow, s.InitialCallWindow},
		{SettingMaxMessageSize, s.MaxMessageSize},
		{SettingMaxMetadataSize, s.MaxMetadataSize}}
}
