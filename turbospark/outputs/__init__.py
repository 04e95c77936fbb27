"""What leaves turbospark: exporters (Parquet, JSON, replay) and plots."""
