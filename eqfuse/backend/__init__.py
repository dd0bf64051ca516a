"""The backend: fused kernel bodies -> kernel plans (lower) -> C (emit) -> loaded
libraries (cbuild), for the machine model in `machine`."""
