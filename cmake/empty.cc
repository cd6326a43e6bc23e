// Keeps every layer library non-empty while its directory is being filled.
