"""stratameter soak: long-running fault-injection benchmark."""
