"""pytest plugin (entry point); fixtures grow in the testing issue."""
