"""corral.control"""
