"""Entry points: the command line, the demo, the generator, what-if, the report and the
page."""
