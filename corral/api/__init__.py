"""corral.api"""
