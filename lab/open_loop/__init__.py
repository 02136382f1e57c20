"""Open-loop load (docs/open-loop.md): arrival schedules and their options, the client that sends
at intended times, the rate search, a level's open-loop figures and their report."""
