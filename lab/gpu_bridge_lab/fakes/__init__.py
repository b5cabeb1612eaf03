"""In-memory fakes of the adapters, implementing the product's Protocols and enforcing the same
rules (tests/contract runs the same assertions against each fake and its real adapter)."""
