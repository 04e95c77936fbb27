"""The capture: its format (one definition the recorder and every reader share) and its readers."""
