from corral.cli import app

app()
