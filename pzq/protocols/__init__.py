"""Pure protocol machines: frames or bytes in, events and frames out. No sockets, no store."""
